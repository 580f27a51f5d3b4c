"""Optional integrations with third-party tools; nothing here is imported by `mrc` itself.

`mrc.contrib.scapy_mrc` holds scapy layers for every header of docs/WIRE.md §2–§6 (it needs
scapy: `pip install 'mrc[dissect]'`). The Wireshark dissector lives outside the package, in
`tools/wireshark/mrc.lua`.
"""
