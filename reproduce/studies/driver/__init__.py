"""The study driver all studies share: a study is data (:class:`~reproduce.studies.driver.study.Study`: its arms, runs,
steps and report) whose ``__main__`` calls :func:`reproduce.studies.driver.cli.main`; its dry runs and parts execute
its plan's pinned commit (:mod:`~reproduce.studies.driver.pin`), in time-boxed parts (:mod:`~.part`)."""
