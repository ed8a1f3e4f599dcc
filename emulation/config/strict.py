"""Every config section refuses keys it does not know (a typo is an error, not a default)."""

from pydantic import ConfigDict

STRICT = ConfigDict(extra="forbid")
