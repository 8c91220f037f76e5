"""The vendor plugin's root module, its names mapped onto lightning_anyaccel's (scripts/vendor_suites/shim)."""
import _vendor_shim

_vendor_shim.populate(globals(), __name__)
