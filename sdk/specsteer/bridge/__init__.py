"""`specsteer bridge`: the SDK as a local JSON-RPC 2.0 process that other languages embed.

`framing` (newline-delimited JSON), `schemas` (bindings/schema, validated with jsonschema),
`errors` (stable error codes), `handlers` (methods over one `Client`), `server` (the stdio loop).
The protocol is specified in docs/bindings.md.
"""
