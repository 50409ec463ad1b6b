"""Notebooks from their single text source: generate (``source``), execute
(``execute``), and the ``course build`` / ``course run`` commands (``build``, ``run``)."""
