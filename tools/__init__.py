"""Developer tools that sit beside the `mrc` package and are not shipped in its wheel.

Holds `tools.testbed` (netns/veth testbeds with an SRv6 fabric and a fault injector, run as
`python -m tools.testbed`). The transport itself lives in `mrc/`; nothing here is imported by it.
"""
