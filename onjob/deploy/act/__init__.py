"""What changes the world: the checkpoint registry (`registry`), the routing log
(`deployments`) and the operator that applies it to the proxy and the engine (`operator`,
`adapters`, `engine`), a person's review (`reviews`), and training runs (`training`, on
this host or through the bucket: `host`). `release` and `loop` call these on `decide`'s
verdicts.
"""
