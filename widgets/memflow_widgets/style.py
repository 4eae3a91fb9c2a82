"""Colours and number formats: those of :mod:`memflow.report.style`, which the HTML report and
these views share, so one category looks the same everywhere.

>>> format_bytes(3 * 2**30)
'3.00 GiB'
"""
from memflow.report.style import *  # noqa: F401,F403  (this module is that one's public face)
from memflow.report.style import __all__  # noqa: F401
