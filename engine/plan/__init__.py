"""`asyncrl plan`: predict a layout's speed with the loop simulator and a cost model (pure Python)."""
