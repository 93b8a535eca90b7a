"""``python -m sb3_worldmodels.zoo train --algo tdmpc2 --env Pendulum-v1``: see :func:`main`."""

from sb3_worldmodels.zoo import main

if __name__ == "__main__":
    main()
