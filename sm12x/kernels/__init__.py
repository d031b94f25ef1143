"""Triton kernels that replace FlashMLA / DeepGEMM ops on SM12x, one op per module, each with its
PyTorch reference in ``sm12x.kernels.reference``. Importing this package imports nothing heavy;
import the op modules directly."""
