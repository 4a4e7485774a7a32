"""`torch.backends` entry point target.

`import torch` loads this through the entry point, which first imports the `torch_fl` package and
so registers the device. When the user imported torch_fl first, torch_fl is already in
sys.modules (part-way through its own `import torch`), the parent import is skipped and this is a
no-op: torch_fl finishes its registration as soon as `import torch` returns.
"""


def load() -> None:
    """Nothing left to do: importing this module's package did the registration."""
