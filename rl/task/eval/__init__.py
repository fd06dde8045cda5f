"""Evaluation of the Memory-R1 task: banks built and questions answered on a split, scored and compared."""
