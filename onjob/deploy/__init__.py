"""The release machinery: which checkpoint serves each alias, and the evidence that moves it.

Two layers and the modules that orchestrate them:

    decide/   what the evidence says (statistics, pairs, prompts, guards, the verdict):
              functions of the store and the settings, acting on nothing
    act/      what changes (registry, routing log, operator, adapters, reviews, training)
    release   a candidate's way from trained to live: reads `decide`, calls `act`
    loop      the periodic loop that re-samples, judges, trains and releases
    compare, judging, admin, progress
              `onjob compare`, `onjob judge`, the admin API and what the loop achieved

`records`, `settings` and `errors` are shared by both layers. `decide` never imports `act`
(an import contract in `make lint`). It drives `judge` and `trainer` through their public
functions and the trainer's child process; it never imports torch.
"""
