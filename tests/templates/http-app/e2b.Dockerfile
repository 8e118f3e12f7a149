# syntax=docker/dockerfile:1
FROM debian:bookworm

ARG APP_DIR=/home/user/app
ENV APP_DIR=${APP_DIR} \
    PYTHONUNBUFFERED=1

# pip runs straight from its wheel (no network: the wheels directory is the package index).
COPY wheels/ /opt/wheels/
RUN python3 "$(ls /opt/wheels/pip-*.whl)/pip" install --no-index --break-system-packages \
        --find-links /opt/wheels warren-hello \
    && python3 -c "import warren_hello; print(warren_hello.greeting())"

USER user
WORKDIR $APP_DIR
COPY --chown=user:user app/ ./
RUN ["python3", "-c", "import pathlib, os; print('app files:', sorted(os.listdir('.')))"]
