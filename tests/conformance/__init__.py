"""The differential suite: the project's tree against SGLang 0.5.23's UnifiedRadixCache.

Run with the oracle venv's python (built by ``scripts/sglang_env.sh``), see
``scripts/conformance.sh`` and ``tests/conformance/README.md``. The main ``pytest`` run
ignores this folder (pyproject ``--ignore``).
"""
