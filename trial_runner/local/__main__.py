"""``python -m mart.trial_runner.local --out DIR --steps N --config DIR/config.json [--memory-capacity-gb X] [--seed S]``"""

from mart.trial_runner.local.worker import main

if __name__ == "__main__":
    main()
