"""The proxy's hot path: what it adds against its peers and bare passthroughs, where its
CPU goes, bodies it checks, load with faults and soak."""
