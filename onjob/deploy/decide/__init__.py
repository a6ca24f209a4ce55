"""What the evidence says: pure functions of the store and the settings, which change
nothing but their own records of evidence (the ledger, the pairs judged).

The paired test's statistics (`stats`) and its share of alpha (`ledger`), the pairs it
reads (`pairs`) and the prompts they are drawn from (`prompts`, `holdout`), the guards
besides it (`guards`, `shape`, `trust`), what the loop's fitted settings and shares are
(`fit`, `fair`), and the one verdict on a candidate (`verdict.decide`). Nothing here moves
a route or loads an adapter: `act` does, and the import contract keeps it that way.
"""
