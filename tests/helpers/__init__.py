"""Helpers shared by tests/image and tests/static, one module per concern: the Docker CLI and
containers (docker), OpenSSH (ssh), Jupyter over HTTP and its kernel websocket (jupyter), host
ports for servers the tests start (ports), tools this host may lack (host), headless Chromium
(browser), the repository's tables read without importing the package (repository).

Imported as `helpers.<module>`: pyproject.toml's [tool.pytest.ini_options] puts tests/ on the path.
"""
