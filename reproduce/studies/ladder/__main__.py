import sys

from reproduce.studies.driver.cli import main
from reproduce.studies.ladder import STUDY

sys.exit(main(STUDY))
