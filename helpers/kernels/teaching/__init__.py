"""Teaching rungs: the readable kernels that come before the tuned ones (notebooks 04 and 07)."""
