"""Fakes of the GPU vendor modules (`pynvml`, `amdsmi`), installed in sys.modules by tests."""
