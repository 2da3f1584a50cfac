"""Online: op graph construction, the C++ engine driver, sampling."""
