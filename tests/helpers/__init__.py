"""Helpers shared by the tests: real models and channels with a declared twist, frame builders,
privacy audits, the CI skip rule, processes under test. Imported as `helpers.NAME` (the tests
folder is on the path through its conftest); nothing here is a test or a mock of a real part."""
