import sys

from reproduce.studies.driver.cli import main
from reproduce.studies.curves import STUDY

sys.exit(main(STUDY))
