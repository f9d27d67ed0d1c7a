"""What chapters draw and print from Results and claim rows, one module per topic (tables, frames, live figures,
prose with measured numbers): views only, outside every figure's compute, tested in tests/. Layer 4, beside
`attnlab.book` and `attnlab.widgets`."""
