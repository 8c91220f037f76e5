"""Device facts and the device-generic plumbing built on them.

What the package knows about each device type (:mod:`.spec`: ``DeviceSpec``; :mod:`.table`: the
device table, data only; :mod:`.devices`: :func:`~.devices.get_spec`, which derives a spec from
torch and refines it with the table) and the small functions that read it: PyTorch's device APIs for any
device (:mod:`.runtime`), the collective backend and fork safety (:mod:`.distributed`), mixed
precision (:mod:`.precision`, FSDP's in :mod:`.sharded_precision`), ``torch.compile``
(:mod:`.compilation`), synchronized BatchNorm (:mod:`.sync_batchnorm`) and what ``torch.profiler``
records (:mod:`.profiling`). Nothing above this
package branches on a device name. It may import the foundation only: ``_compat``,
``troubleshooting`` and the contract package ``_lightning`` (with its typing stubs).
"""
