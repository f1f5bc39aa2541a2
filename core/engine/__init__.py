"""Generation: prefill and the decode loop, sampling, constraints, speculative decoding,
beams, comparison lanes, and the torch-free event vocabulary."""
