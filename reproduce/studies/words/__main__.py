import sys

from reproduce.studies.driver.cli import main
from reproduce.studies.words import STUDY

sys.exit(main(STUDY))
