"""The compile check's alignment hints land on the kernel parameters they name, whatever the order
of the signature dict (Triton reads a hint by the parameter's position)."""
from sm12x.kernels.common.compile_check import launch_hints


def test_hints_follow_the_kernels_parameter_order():
    signature = {"n": "i32", "stride_x": "i64", "x_ptr": "*fp32", "BLOCK": "constexpr"}
    hints = launch_hints(signature, ["x_ptr", "stride_x", "n", "BLOCK"])
    assert set(hints) == {(0,), (1,)}  # x_ptr and stride_x, by their places in the kernel
    assert set(launch_hints(signature)) == {(1,), (2,)}  # without names: the dict's order
