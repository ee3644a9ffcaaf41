"""The pytest plugin: options, the session, isolation, verdicts and the reports."""
