"""Models and their configuration: the MLP family and one module's spec."""
