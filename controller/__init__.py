"""KServe Inference Controller: runs batch inferences against KServe models as Jobs."""
