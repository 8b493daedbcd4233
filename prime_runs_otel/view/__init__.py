"""The local viewer: the store's runs read for people, as pages in the
browser (``prime-runs-otel ui``) and as what ``show`` prints.

Read-only over the spool, beside ``collector/`` in the layering: it imports
``deliver/`` (the spool and its read methods) and ``read/``, and nothing
imports it but ``cli/``. What a page shows the spool keeps up to date as
episodes are stored (``deliver/spool/views.py``), so no page reads every
episode.

- ``runs``: the runs in the one vocabulary every command and page uses;
- ``run_data``, ``episodes``, ``compare``: each page's data;
  ``distributions``: bins, percentiles and series from the kept aggregates;
  ``older``: runs stored by an earlier release, read into the views once;
- ``chart_data``: a run's curves as JSON, drawn in the browser by uPlot
  (``static/``); ``charts``: the distributions and scatter as server-side
  SVG; ``html``: the templates' environment, links and escaping;
  ``pages`` and ``templates/``: each page's HTML;
- ``app``: the Starlette app (routes on the path as sent, who may read,
  answers); ``server``: uvicorn. Only ``app``, ``html``, ``pages``, ``charts`` and
  ``server`` need the ``ui`` extra: ``show`` imports none of them.
"""
