"""More than one of anything: hosts failing over, the hand-off through object storage,
engine pools, server workers, and tenants."""
