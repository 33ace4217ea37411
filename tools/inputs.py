"""Old name of :mod:`passctl.support.inputs` (seeded random inputs), which moved to the neutral
layer below passes and emitters; this module keeps ``passctl.tools.inputs`` imports working. New
code imports :mod:`passctl.support.inputs`."""

from passctl.support.inputs import (InputPlan, check_dim_names, check_override,  # noqa: F401
                                    draw_inputs, drop_initializer_data, graph_inputs, load_header,
                                    make_inputs, plan_inputs)
