"""The release machinery: which checkpoint serves each alias, and the evidence that moves it.

Two layers and the modules that orchestrate them:

    decide/   what the evidence says (statistics, pairs, prompts, guards, the verdict):
              functions of the store and the settings, acting on nothing
    act/      what changes (registry and runs, routing log, operator, holds, adapters,
              reviews, training)
    release   a candidate's way from trained to live: reads `decide`, calls `act`
    loop      the periodic loop that re-samples, judges, trains and releases
    compare, judging, admin, progress
              `onjob compare`, `onjob judge`, the admin API and what the loop achieved

`records`, `settings` and `errors` are shared by both layers. `decide` never imports `act`
(an import contract in `make lint`). It drives `judge` and `trainer` through their public
functions and the trainer's child process; it never imports torch.

What each module holds:

in two layers and the modules that orchestrate them. **`decide/`**, what the evidence
says, functions of the store and the settings that move nothing: the one verdict for
both stages (`verdict.py: decide`); the paired evidence: rounds, outcomes, the referee,
test ids (`pairs.py`); which logged prompts a test may use, in the day's mix of
tool-call and answer turns, hours and conversation lengths at odds that stay the day's,
and the strata a test would use up (`prompts.py`); how many answers per arm a test's
next pairs get and what its decision will cost, from the referee's noise and the
engine's tokens read from its own pairs (`answers.py`; the maths, pure: the within and
between noise, the pairs a +delta candidate needs at a level, the k within
`loop.decision_tokens`: `noise.py`); the guards as typed `Guard`s: errors and latency on
traffic, and the candidate's (`guards.py`), guards on the answers' shape against reward
hacking (`shape.py`), on a checkpoint's KL to the base model and its judges' agreement
with users, and who may promote (`trust.py`: automatic with a referee or users checking
the coach, else review); the held-out slice, decided at a scenario's first sight
(`holdout.py`); the settings a deployment leaves unset, fitted to what the log shows:
the held-out share, the groups that start a run (per lineage, from its own keys' groups
with a spread of rewards; a lineage's first run on a few, and none waiting past ten
minutes' worth), the canary's share (its guards' conversations in about five minutes,
per lineage, of its own keys' conversations) and how long a conversation is idle before
the judge groups it (`judge.settle_s`), logged when they change and in `onjob status`
(`fit.py`); the statistics alone: win rates, Wilson intervals, the e-process, each
candidate's share of alpha (`stats.py`, pure); each alias's stream of candidates: index
k, outcomes, canary rounds, the back-off and the daily budget, and the last verdict on
each (`ledger.py`); what a verdict shows, as typed records: the test's state, what it
expects to cost (`Forecast`), the held-out slice's, each guard's figures with its
outcome (`Alarm`: tripped or holding), the `Verdict` (`evidence.py`); each tenant's
daily share of the trainer and the judge (`fair.py`). **`act/`**, what changes: the
checkpoint registry (`registry.py`; a training run's row and its candidate: `runs.py`),
the engine's LoRA endpoints (`adapters.py`) and the client to the engine (`engine.py`),
the routing log (`deployments.py`) and the operator that applies it to database,
engines and router (`operator.py`); a worker's hold on one
lineage's work, renewed while its job runs (`holds.py`); canaries ready for a
person's review (`reviews.py`); training runs from the server's side: a child process,
or a job through `trainer.bucket` (`trainer.runner`), every checkpoint published when a
bucket is set (`training.py`); the host a local run shares with the engine: the run on
`trainer.threads` cores (half the host's by default), a local engine serving on the
others until it ends, the traffic never paused (`host.py`). **Orchestrating**: the
release pipeline, top to bottom: trained → offline test at the engine's speed → canary
guards → promote, review or retire, reading `decide`'s verdict and calling `act`
(`release.py`); the loop: every lineage's open canary decided each iteration, one
training run per iteration, the lineages with groups ready in turn (`loop.py`); `onjob
compare` (`compare.py`); `onjob judge` (`judging.py`); the admin API, its handlers
module-level functions taking the `Admin` dependency (`admin.py`); `GET /admin/status`
and its parts as records: the loop's state (`LoopView`: its stage, paused or running,
its last iteration, the scorer in force, and its one line for `onjob status` and the
dashboard), each lineage's (`LineState`: groups ready against those a run needs, what
its run and its canary's decision wait for), the release mode and reviews
(`act/reviews.py: ReleaseStatus`), the fitted settings (`decide/fit.py: Fitted`),
budgets and shares (`BudgetState`, `ShareState`) (`status.py`); the loop's stage, pause,
time per stage and groups per lineage as `GET /metrics` reads them at each scrape
(`metrics.py`); reward per checkpoint (`progress.py`). **Shared by both layers**: their
rows as typed records, read with `Store.rows`: `Checkpoint`, `Routing`, an applied
`Change`, and the proxy's `Arms` (`records.py`); one exception tree (`errors.py`);
`settings.py` holds `LoopSettings` and `DeploySettings`. An import contract keeps
`decide` from importing `act` and both from importing what orchestrates them
"""
