import torch


def test_torch_is_the_cpu_build():
    # the exact pin torch==2.13.0 selects the local CPU wheel; a CUDA build means the pin was loosened
    assert torch.version.cuda is None, (
        f"CUDA torch installed ({torch.__version__}, cuda {torch.version.cuda})"
    )
