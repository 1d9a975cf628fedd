"""What runs cost: the paper profile's plan and its table (FLOPs, memory, GPU-hours), a model's cost per
sample on the meta device, and each evaluation kind's cost model for the runner's estimates."""
