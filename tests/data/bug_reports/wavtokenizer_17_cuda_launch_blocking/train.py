"""WavTokenizer training entry point (jishengpeng/WavTokenizer#17): the file sets CUDA_LAUNCH_BLOCKING=1
at import, left over from debugging, and the reporter asks whether removing it speeds training up.
"""
import os

os.environ["CUDA_LAUNCH_BLOCKING"] = "1"

from pytorch_lightning.cli import LightningCLI

if __name__ == "__main__":
    cli = LightningCLI(run=False)
    cli.trainer.fit(model=cli.model, datamodule=cli.datamodule)
