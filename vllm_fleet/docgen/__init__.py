"""Reference tables in ``docs/*.md`` generated from the code, so that the docs cannot drift.

A table lives between two markers in a markdown file::

    <!-- generated:fleet-file:supervisor -->
    ...the table, rewritten by the generator...
    <!-- /generated -->

The name after ``generated:`` says what to render (``sources.py``): ``fleet-file[:KEY.PATH]`` (a
model of the fleet file), ``gateway-settings`` (the ``FLEET_*`` variables), ``metrics:gateway`` and
``metrics:supervisor`` (the metric registries). Descriptions come from ``Field(description=...)``
and the metrics' help texts: to change a table, change the code, then run

    python -m vllm_fleet.docgen --write     # rewrite every table
    python -m vllm_fleet.docgen             # check only: tables, coverage, links (exit 1 on a problem)

``tests/test_docs.py`` runs the check. Nothing here runs at import time, and nothing in the gateway
or the supervisor imports this package.
"""
