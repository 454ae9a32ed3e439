"""What is trained: the workload spec (model, data, optimizer, steps), its seeded initial
parameters and its learning-rate schedule, and the bundled workload files (*.toml, beside these
modules). A pretrained model's config and weights are sextant.pretrained's."""
