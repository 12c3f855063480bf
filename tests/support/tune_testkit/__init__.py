"""Trainables shipped to the Ray cluster by the tests (as a py_module), one per Ray Tune trainable form."""
