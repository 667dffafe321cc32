"""torch.compile backend, lowering to kernel IR, epilogue fusion and wrapper codegen."""
