"""Dataset construction: turn successful trajectories into verified recovery cases (paper 5.2, A.1)."""
