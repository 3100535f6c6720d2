import sys

from gateway.main import main

sys.exit(main())
