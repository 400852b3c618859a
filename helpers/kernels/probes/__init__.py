"""Hardware probes: kernels that measure the memory hierarchy and the roofline, not the course's workload."""
