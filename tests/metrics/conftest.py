from tests.crash.harness import env  # noqa: F401  (the shared fixture)
