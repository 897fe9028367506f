"""What the driver does before any actor starts, without Ray.

    preflight.py  checks of the user's inputs (model directory, dataset) that must end as one line and exit
                  code 1, not as an actor failure minutes later
    probe.py      the launch-time measurement behind "auto" precision and threads (`engine.plan.auto` decides)
"""
