"""The engine: adapters aside, everything that evaluates a Function and judges what it recorded."""
