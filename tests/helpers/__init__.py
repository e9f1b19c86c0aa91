"""Helpers shared by the test suites: models as exporters write them (:mod:`.models`), the
check of hard-multiplier netlists against plain products (:mod:`.hard_products`), and the
paths of the repository (:mod:`.paths`)."""
