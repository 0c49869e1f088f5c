from torchlab.train import main  # `python train.py FLAGS` is `torchlab train FLAGS`: see torchlab/train.py

main()
