"""Each notebook's measurements, one module a study, built on the kernels and the model floor."""
