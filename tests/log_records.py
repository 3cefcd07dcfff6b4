"""Catch the records one package logger emits, on the logger itself."""

import logging


class Records(logging.Handler):
    """The records one logger emits, caught on the logger itself: other tests in the same
    process may have reconfigured the root's handlers or disabled existing loggers."""

    def __init__(self, name):
        super().__init__(logging.WARNING)
        self.logger, self.records = logging.getLogger(name), []

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        self.saved = self.logger.disabled, self.logger.level
        self.logger.disabled = False
        self.logger.setLevel(logging.WARNING)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.disabled, level = self.saved
        self.logger.setLevel(level)
