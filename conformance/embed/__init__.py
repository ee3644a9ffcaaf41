"""Ways in besides the pytest plugin: :func:`conformance.check` inside any test, notebook or
script (``check.py``), and the spec ghostwriter behind ``python -m conformance write``
(``ghostwriter.py``). Both sit above the plugin layer and run the same engine."""
