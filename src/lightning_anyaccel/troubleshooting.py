"""Every error of the package points to its entry of the troubleshooting page.

``docs/troubleshooting.md`` has one entry per error class, labelled with the class name in lower
case; :class:`LinkedError` ends the message of an error class with the address of that entry.
``tests/test_docs_sync.py`` checks that the address is the documentation URL of ``pyproject.toml``
and that every linked class has its label on the page.
"""

from __future__ import annotations

from typing_extensions import override

#: the hosted troubleshooting page (pyproject.toml's Documentation URL + docs/troubleshooting.html)
TROUBLESHOOTING_URL = "https://lightning-anyaccel.readthedocs.io/en/latest/docs/troubleshooting.html"


def troubleshooting_link(error_class: type) -> str:
    """The address of ``error_class``'s entry on the troubleshooting page."""
    return f"{TROUBLESHOOTING_URL}#{error_class.__name__.lower()}"


class LinkedError:
    """Mixin for the package's exception classes (first base): ``str()`` ends with the class's
    troubleshooting entry. The message itself, ``args`` and pickling are unchanged."""

    @override
    def __str__(self) -> str:
        return f"{super().__str__()} (troubleshooting: {troubleshooting_link(type(self))})"
