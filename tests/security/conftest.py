# The real stack (dispatcher, web, SDK workers as processes) for the tests here too.
from tests.e2e.conftest import stack  # noqa: F401
