# Loads the plugin for checkout and vendored runs (installed runs get it from the pytest11
# entry point, registered under this same name, so it is never loaded twice).
pytest_plugins = ["autograd_conformance_plugin"]
