"""`asyncrl plan`: the prediction of a layout's speed with the loop simulator (apart from the run plan).

    costs.py       the cost model (calibration file, else FLOP/bandwidth estimates from config.json + hardware)
    calibrate.py   a calibration file from a real run's metrics.jsonl
    prediction.py  one prediction (async, sync and colocated on the same accelerators)
    sweep.py       a grid of them

Pure Python like `engine.plan` (no torch, no ray): it runs the real loop cores (`engine.loop`) in the costed
simulator (`engine.loop.sim.costed`) and reads the run plan's formulas (`engine.plan.sizes`).
"""
